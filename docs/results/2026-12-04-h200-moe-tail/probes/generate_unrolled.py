"""bench generate with every batch's decode steps written out layer by layer (models.model.UNROLL_BATCHES
widened to 1..16), the same command line otherwise."""
import runpy, sys
import te_async.models.model as model
model.UNROLL_BATCHES = range(1, 17)
sys.argv = ["te_async.bench"] + sys.argv[1:]
runpy.run_module("te_async.bench", run_name="__main__")
