"""What a run declares: run.toml and its parts ([[source]], amendments, bounds), parsed and checked. Pure."""
