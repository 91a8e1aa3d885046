"""server.launch's command template: placeholders filled inside words, values never split (the job
that starts, waits for and stops the server: tests/workflow/test_launch.py)."""


import pytest

from budgetgen.errors import UserError
from budgetgen.launch import render_command


def test_render_command_fills_placeholders_inside_words_and_never_splits_values():
    argv = render_command("python -m sglang.launch_server --model-path {model_path} --port={port} "
                          "--json-args '{\"a\": 1}' --served-model-name {model}",
                          {"port": 31000, "host": "127.0.0.1", "model": "my model $(touch x)",
                           "model_path": "/m/Qwen 3", "dataset": "B1"})
    assert argv == ["python", "-m", "sglang.launch_server", "--model-path", "/m/Qwen 3", "--port=31000",
                    "--json-args", '{"a": 1}', "--served-model-name", "my model $(touch x)"]
    with pytest.raises(UserError, match="not a valid command line"):
        render_command("python 'unclosed", {})
