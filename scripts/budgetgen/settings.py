"""Settings, built once from the validated config (its defaults come only from the schema).

Everything here takes a validated config (the Snakefile's, or budgetgen.configfile.load_config's, whose
schema's defaults are filled in). Entry points get their settings from Snakemake (`snakemake.config`)
or from `--config FILE --dataset D` (budgetgen.configfile), never from defaults of their own.

- generation_setting(config, D, key): a dataset's own value, else the `generation` section's.
- content_settings(config, D): the content keys' values (identity.CONTENT_GENERATION_KEYS: what changes a
  dataset's data): the inference rule's rerun trigger, and their content key (config_sha256).
- DatasetPaths: where one dataset's files live (relative to the working directory).
- InferenceSettings.from_config(config, D): everything one inference job needs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import engines
from .canary import Canary
from .conversations import Plan
from .identity import (
    CONTENT_GENERATION_KEYS,
    CONTENT_TOKENIZER_KEYS,
    Identity,
    Policy,
    content_key,
    gates_sha,
    request_params,
    settings_of,
)
from .mixture import DEFAULT_CELL, Cell, Mixture, merged_extra_body
from .paths import DatasetPaths
from .processes import stream_processes, usable_cpus
from .quality import Gate

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from .forecast import DumpShape
    from .prompts import PromptSet
    from .tokenization import TokenizeOptions


def generation_setting(config: dict[str, Any], dataset: str, key: str) -> Any:
    """A generation setting of one dataset: its own override, else the `generation` default."""
    own = config["datasets"][dataset]
    return own[key] if key in own else config["generation"].get(key)


def token_budget(config: dict[str, Any], dataset: str) -> int:
    return int(generation_setting(config, dataset, "token_budget"))


def chat_template_kwargs(config: dict[str, Any], dataset: str) -> dict[str, Any]:
    """The dataset's chat_template_kwargs (its extra_body's): the template switches its requests send."""
    return dict((generation_setting(config, dataset, "extra_body") or {}).get("chat_template_kwargs") or {})


def inference_threads(config: dict[str, Any]) -> int:
    """Cores an inference job takes from Snakemake's --cores: none for an HTTP client (it waits on the
    server, a fraction of a core), so the datasets' jobs overlap on one server under any --cores and
    the server's queue fills the slots one dataset's drain leaves idle (--resources server_slots=N
    caps the sum); one when the job launches a server of its own (server.launch)."""
    return 1 if config["server"].get("launch") else 0


def generation_plan(config: dict[str, Any], dataset: str) -> Plan:
    """How the dataset's prompts become generations (budgetgen.conversations.Plan)."""
    g = lambda key: generation_setting(config, dataset, key)  # noqa: E731
    return Plan(turns=g("turns"), samples=int(g("samples_per_prompt")), history_reasoning=g("history_reasoning"))


def dataset_request_params(config: dict[str, Any], dataset: str) -> dict[str, Any]:
    """The request params the dataset's inference job sends (and journals with every response)."""
    g = lambda key: generation_setting(config, dataset, key)  # noqa: E731
    return request_params(config["server"]["model"], g("max_tokens"), g("temperature"), g("top_p"), g("extra_body"),
                          g("thinking_budget"))


def generation_identity(config: dict[str, Any], dataset: str) -> Identity:
    """The identity of the generations the dataset's next inference job makes (budgetgen.identity)."""
    return Identity.of(settings_of(dataset_request_params(config, dataset), generation_plan(config, dataset)))


def dataset_mixture(config: dict[str, Any], dataset: str) -> Mixture:
    """The dataset's cells and validation split (budgetgen.mixture): each cell's settings are its own
    overrides over the dataset's (extra_body merged); without a mixture, one cell `default` with the
    dataset's settings (its identity is generation_identity's)."""
    g = lambda key: generation_setting(config, dataset, key)  # noqa: E731
    cells = []
    for name, own in (g("mixture") or {DEFAULT_CELL: {"share": 1.0}}).items():
        c = lambda key: own[key] if key in own else g(key)  # noqa: E731,B023
        params = request_params(config["server"]["model"], c("max_tokens"), c("temperature"), c("top_p"),
                                merged_extra_body(g("extra_body"), own.get("extra_body")), c("thinking_budget"))
        plan = Plan(turns=c("turns"), samples=int(c("samples_per_prompt")), history_reasoning=c("history_reasoning"))
        gate = Gate.of({**quality_section(config, dataset), **(own.get("quality") or {})})
        cells.append(Cell(name, float(own["share"]), params, plan, Identity.of(settings_of(params, plan)), gate))
    return Mixture.of(cells, token_budget(config, dataset), validation_share(config, dataset), int(g("seed")))


def reasoning_tags(config: dict[str, Any]) -> tuple[str, str] | None:
    """tokenizer.reasoning_tags (open, close), or None (the tokenizer's own, else <think>/</think>)."""
    tags = config["tokenizer"].get("reasoning_tags")
    return tuple(tags) if tags else None


def quality_section(config: dict[str, Any], dataset: str) -> dict[str, Any]:
    """The dataset's quality gate settings: its own `quality` keys over generation.quality's (its
    `breaker` keys over generation.quality.breaker's)."""
    general, own = config["generation"].get("quality") or {}, config["datasets"][dataset].get("quality") or {}
    merged = {**general, **own}
    if "breaker" in own:
        merged["breaker"] = {**(general.get("breaker") or {}), **own["breaker"]}
    return merged


def validation_share(config: dict[str, Any], dataset: str) -> float:
    """The share of the dataset's prompts (and budget) its validation split holds (0: none)."""
    return float((generation_setting(config, dataset, "validation") or {}).get("share", 0))


def settings_policy(config: dict[str, Any], dataset: str, mix: Mixture | None = None) -> Policy:
    """The identities now (one per cell) and generation.on_settings_change: which journal records count;
    `mix`: the dataset's mixture when the caller has built it."""
    mix = mix or dataset_mixture(config, dataset)
    cells = () if len(mix.cells) == 1 else tuple((c.name, c.identity) for c in mix.cells)
    return Policy(mix.cells[0].identity, generation_setting(config, dataset, "on_settings_change"), cells=cells,
                  layout=mix.layout_sha(), quality=gates_sha((c.name, c.gate.describe()) for c in mix.cells))


def earlier_prompts(config: dict[str, Any], dataset: str) -> tuple[str, ...]:
    """The prompts files of the datasets before this one in the config, whose prompts this one leaves out
    under generation.dedup_across_datasets (else none)."""
    if not config["generation"].get("dedup_across_datasets"):
        return ()
    names = list(config["datasets"])
    return tuple(DatasetPaths.of(config, d).prompts for d in names[: names.index(dataset)])


def content_settings(config: dict[str, Any], dataset: str) -> dict[str, Any]:
    """What makes the dataset's data what it is: the model, the content generation settings, the
    tokenizer settings that change rows. Changing any of these changes the data. A key added in a later
    release (thinking_budget) is left out while unset, so an upgrade alone reruns nothing."""
    generation = {k: generation_setting(config, dataset, k) for k in CONTENT_GENERATION_KEYS}
    if generation.get("thinking_budget") is None:
        generation.pop("thinking_budget", None)
    return {
        "model": config["server"]["model"],
        "generation": generation,
        "tokenizer": {k: config["tokenizer"].get(k) for k in CONTENT_TOKENIZER_KEYS},
    }


def rerun_trigger(config: dict[str, Any], dataset: str, stage: str) -> dict[str, Any]:
    """What makes a stage's output another one when it changes: its rule's one rerun param
    (rules/common.smk). inference: the content generation settings, the model and on_bad_line; finalize:
    which records count (the policy key); tokenize: the content key, the tokenizer's files, the
    template switches and the quality gates."""
    if stage == "inference":
        return {"generation": content_settings(config, dataset)["generation"], "model": config["server"]["model"],
                "on_bad_line": generation_setting(config, dataset, "on_bad_line")}
    if stage == "finalize":
        return settings_policy(config, dataset).key()
    if stage == "tokenize":
        from .turn_format import tokenizer_sha256

        return {"content": config_sha256(config, dataset),
                "tokenizer_sha256": tokenizer_sha256(config["tokenizer"]["path"]),
                "chat_template_kwargs": chat_template_kwargs(config, dataset),
                "quality": settings_policy(config, dataset).quality}
    raise ValueError(stage)


def config_sha256(config: dict[str, Any], dataset: str) -> str:
    """The content key of the dataset's content settings (identity.content_key), recorded in its tokenized.arrow."""
    return content_key(content_settings(config, dataset))


@dataclass(frozen=True)
class InferenceSettings:
    """Everything one inference job needs, from the config (see the schema for each key)."""

    paths: DatasetPaths
    budget: int
    urls: tuple  # server.base_url as a list; empty with server.launch
    model: str
    api_key_env: str | None
    max_tokens: int
    concurrency: int
    temperature: float | None
    top_p: float | None
    seed: int
    extra_body: dict
    on_bad_line: str
    request_timeout_s: float
    max_retries: int
    unreachable_deadline_s: float
    startup_wait_s: float
    progress_interval_s: float
    terminal_progress_interval_s: float
    engine: str  # the server's dialect (budgetgen.engines): openai, vllm, sglang, llamacpp
    want_ids: bool  # server.return_token_ids: ask for the prompt's and the generated token ids
    continuous_usage_stats: bool
    client_processes: int  # stream worker processes (budgetgen.stream_workers); 0: streams read in the job
    endpoint_concurrency: int
    endpoint_recheck_s: float
    launch: str | None
    model_path: str | None
    launch_port: int
    launch_ready_timeout_s: float
    plan: Plan  # the dataset's own (its first cell's under a mixture: for records written before identities)
    policy: Policy  # the generation identities now, and what a journal made under other settings means
    mixture: Mixture  # the cells and validation split: one lane per cell and split, each with its budget
    earlier_prompts: tuple  # generation.dedup_across_datasets: the earlier datasets' prompts files
    forecast: object  # forecast.DumpShape of the target model, or None (storage forecast)
    reasoning_tags: tuple | None = None  # tokenizer.reasoning_tags: what quality.observe looks for
    tokenizer_path: str = ""  # tokenizer.path: its special tokens are read by the job (quality's template_leak)
    breaker: tuple = (50, 0.5)  # quality.breaker (window, share): budgetgen.breaker
    min_keep_share: float = 0.0  # quality.min_keep_share: a run that keeps less fails
    canary: object = None  # canary.Canary of server.canary: the job asks it of a server it launches
    thinking_processor: str | None = None  # server.thinking_processor: SGLang's thinking-budget processor

    @classmethod
    def from_config(cls, config: dict[str, Any], dataset: str, slots: int | None = None,
                    files: Mapping[str, str] | None = None) -> InferenceSettings:
        """slots: the server_slots Snakemake granted the job; in flight = the lower of it and the
        dataset's concurrency (the job says so when it is lower). files: the rule's declared files
        ({DatasetPaths field: path}), where they differ from DatasetPaths.of's."""
        server = config["server"]
        g = lambda key: generation_setting(config, dataset, key)  # noqa: E731
        urls = server.get("base_url") or []
        engine, want_ids = engines.resolve(server)
        concurrency = int(g("concurrency"))
        if slots is not None:
            concurrency = min(concurrency, int(slots))
        mix = dataset_mixture(config, dataset)
        quality = quality_section(config, dataset)
        return cls(
            paths=DatasetPaths.of(config, dataset).with_files(files or {}), budget=token_budget(config, dataset),
            urls=tuple([urls] if isinstance(urls, str) else urls), model=server["model"],
            api_key_env=server.get("api_key_env"), max_tokens=int(g("max_tokens")), concurrency=concurrency,
            temperature=g("temperature"), top_p=g("top_p"), seed=int(g("seed")), extra_body=dict(g("extra_body") or {}),
            on_bad_line=g("on_bad_line"), request_timeout_s=float(server["request_timeout_s"]),
            max_retries=int(server["max_retries"]), unreachable_deadline_s=float(server["unreachable_deadline_s"]),
            startup_wait_s=float(server["startup_wait_s"]), progress_interval_s=float(server["progress_interval_s"]),
            terminal_progress_interval_s=float(server["terminal_progress_interval_s"]),
            engine=engine, want_ids=want_ids,
            continuous_usage_stats=bool(server["continuous_usage_stats"]),
            client_processes=stream_processes(server["client_processes"], concurrency, usable_cpus()),
            endpoint_concurrency=int(server["endpoint_concurrency"]),
            endpoint_recheck_s=float(server["endpoint_recheck_s"]), launch=server.get("launch"),
            model_path=server.get("model_path"), launch_port=int(server["launch_port"]),
            launch_ready_timeout_s=float(server["launch_ready_timeout_s"]), plan=generation_plan(config, dataset),
            policy=settings_policy(config, dataset, mix), mixture=mix,
            earlier_prompts=earlier_prompts(config, dataset), forecast=dump_shape(config),
            reasoning_tags=reasoning_tags(config), thinking_processor=server.get("thinking_processor"),
            tokenizer_path=config["tokenizer"]["path"],
            breaker=(int(quality["breaker"]["window"]), float(quality["breaker"]["share"])),
            min_keep_share=float(quality["min_keep_share"]), canary=Canary.of(config),
        )

    @property
    def dataset(self) -> str:
        return self.paths.dataset

    @property
    def identity(self) -> Identity:
        return self.policy.current

    def load_prompts(self) -> PromptSet:
        """The dataset's prompts (prompts.PromptSet), less those of earlier datasets under
        generation.dedup_across_datasets."""
        from .prompts import load_prompts, without_earlier

        pset = load_prompts(self.paths.prompts, on_bad_line=self.on_bad_line)
        return without_earlier(pset, self.earlier_prompts, self.on_bad_line) if self.earlier_prompts else pset


def dump_shape(config: dict[str, Any]) -> DumpShape | None:
    """The storage forecast's model shape (budgetgen.forecast.DumpShape) from tokenizer.model_config, or
    config.json in the tokenizer folder; None when neither is there."""
    from .forecast import DumpShape

    t = config["tokenizer"]
    return DumpShape.read(t.get("model_config") or os.path.join(t["path"], "config.json"),
                                      aux_layers=int(t["forecast_aux_layers"]),
                                      dtype_bytes=int(t["forecast_dtype_bytes"]),
                                      required=bool(t.get("model_config")))


@dataclass(frozen=True)
class TokenizeSettings:
    """Everything one tokenize job needs, from the config (the tokenizer section; the dataset's
    chat_template_kwargs only for records that carry no request params of their own)."""

    paths: DatasetPaths
    tokenizer: str
    max_length: int
    processes: int
    allow_mixed_settings: bool
    use_server_token_ids: bool
    trust_remote_code: bool
    reasoning_tags: tuple | None
    max_skipped_pct: float
    chat_template_kwargs: dict
    config_sha256: str
    policy: Policy  # which records' identities belong in the rows (extend: several, each row says its own)
    validation: bool  # the dataset has a validation split: tokenize writes each split's rows to its file
    gates: tuple = ()  # ((cell, quality.Gate), ...): what each cell's quality gate keeps
    check_usage: bool = True  # tokenizer.check_usage: rows built from text held against the server's usage
    engine: str = "openai"  # the server's dialect (budgetgen.engines), named when the usage check refuses

    @classmethod
    def from_config(cls, config: dict[str, Any], dataset: str, processes: int | None = None,
                    files: Mapping[str, str] | None = None) -> TokenizeSettings:
        """processes: the threads Snakemake granted the job (--cores caps tokenizer.processes)."""
        t = config["tokenizer"]
        mix = dataset_mixture(config, dataset)
        return cls(
            paths=DatasetPaths.of(config, dataset).with_files(files or {}), tokenizer=t["path"],
            max_length=int(t["max_length"]),
            processes=int(processes if processes is not None else t["processes"]),
            allow_mixed_settings=bool(t["allow_mixed_settings"]), use_server_token_ids=bool(t["use_server_token_ids"]),
            trust_remote_code=bool(t["trust_remote_code"]),
            reasoning_tags=reasoning_tags(config),
            max_skipped_pct=float(t["max_skipped_pct"]),
            chat_template_kwargs=chat_template_kwargs(config, dataset),
            config_sha256=config_sha256(config, dataset), policy=settings_policy(config, dataset, mix),
            validation=validation_share(config, dataset) > 0,
            gates=tuple((c.name, c.gate) for c in mix.cells), check_usage=bool(t["check_usage"]),
            engine=engines.resolve(config["server"])[0],
        )

    def options(self, split: str = "train") -> TokenizeOptions:
        """What tokenize_file needs for one split's rows (tokenization.TokenizeOptions): on_settings_change
        extend keeps records of earlier settings and a mixture has one identity per cell, so there each
        row says its own (identity and cell columns) instead of mixed settings being refused."""
        from .tokenization import TokenizeOptions

        return TokenizeOptions(
            tokenizer=self.tokenizer, max_length=self.max_length, processes=self.processes,
            chat_template_kwargs=self.chat_template_kwargs, use_server_token_ids=self.use_server_token_ids,
            trust_remote_code=self.trust_remote_code, reasoning_tags=self.reasoning_tags,
            allow_mixed_settings=self.allow_mixed_settings or self.policy.on_change == "extend"
            or len(self.policy.identities) > 1,
            max_skipped_pct=self.max_skipped_pct, split=split if self.validation else None,
            config_sha256=self.config_sha256, gates=self.gates, check_usage=self.check_usage, engine=self.engine)
