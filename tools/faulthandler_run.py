"""faulthandler_run.py SECONDS MODULE ARGS...: runs `python -m MODULE ARGS` and, if it has not
finished after SECONDS, prints every Python thread's stack (it keeps running). For hangs."""

import faulthandler
import runpy
import sys

faulthandler.dump_traceback_later(float(sys.argv[1]), exit=False)
sys.argv = [sys.argv[2], *sys.argv[3:]]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
