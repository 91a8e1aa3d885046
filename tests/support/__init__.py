"""Test-support code (importable as `support` under pytest: tests/ is on sys.path via conftest)."""
