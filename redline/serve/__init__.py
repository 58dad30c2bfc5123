"""`redline serve`: an OpenAI-compatible HTTP server (api.py) over a continuous-batching scheduler
(scheduler.py) that runs the inference engine's DecodeBatch in one background thread: of the server's process, or
of an engine process of its own (engine_process.py, the default on a GPU)."""
