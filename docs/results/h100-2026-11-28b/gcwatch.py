import gc, sys, time
events = []
start = {}
def cb(phase, info):
    if phase == "start":
        start["t"] = time.perf_counter()
    elif info["generation"] == 2:
        events.append((time.perf_counter(), (time.perf_counter() - start["t"]) * 1000, info["collected"]))
gc.callbacks.append(cb)
import atexit
t0 = time.perf_counter()
atexit.register(lambda: print(f"GC gen2: {len(events)} collections, ms:", [round(e[1]) for e in events],
                              "at s:", [round(e[0]-t0, 1) for e in events], file=sys.stderr))
from redline.cli import main
sys.argv = ["redline"] + sys.argv[1:]
sys.exit(main())
