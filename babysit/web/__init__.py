"""A read-only web page of runs, curves and verdicts, and Prometheus metrics (docs/web.md).

`data` reads (the shell), `pages` and `svg` render (pure), `metrics` formats /metrics (pure), `server`
serves them with aiohttp; `babysit web` and `babysit up --web PORT` start it.
"""
