"""bench generate with te_async.mla_token.AUTO_MAX_BATCH raised to 8 (session 45: the call at B=4 and 8)."""
import sys
import te_async.mla_token
te_async.mla_token.AUTO_MAX_BATCH = 8
from te_async.bench.__main__ import main
main(sys.argv[1:])
