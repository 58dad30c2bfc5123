"""`redline serve`: an OpenAI-compatible HTTP server (api.py) over a continuous-batching scheduler
(scheduler.py) that runs the inference engine's DecodeBatch in one background thread."""
