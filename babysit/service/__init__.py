"""`babysit up`: the daemon that babysits every registered run, and its GPU sampler thread."""
