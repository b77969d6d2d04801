"""What every part of babysit shares at run time: the clock, one-shot timers, the exit watcher, the wake pipe,
atomic file replacement, named crash points, logging, and the registry (babysit.toml)."""
