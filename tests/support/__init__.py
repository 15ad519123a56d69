"""Test helpers shared by the integration, reliability, container and bench suites."""
