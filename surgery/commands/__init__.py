"""CLI commands, one module per area; each registers its commands on ``surgery.cli.cli``."""
