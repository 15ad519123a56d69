"""Server processes for the tests and the benchmark: start one from an argv and an environment, wait until it
answers ready, stop it. Neither the tests nor the bench owns this (the bench is not a test dependency, the tests are
not the bench's), and it does not ship in the wheel."""

from harness.server import REPO, SERVICE_ARGV, ServerProcess, free_port, offline_env, python_module

__all__ = ["REPO", "SERVICE_ARGV", "ServerProcess", "free_port", "offline_env", "python_module"]
