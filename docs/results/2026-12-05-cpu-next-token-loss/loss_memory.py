"""XLA CPU compile of bench train-model's step, device contender, deepseek-v2-lite first 4 layers,
1 x 4096 tokens, bf16: temp GB with models.next_token_loss (new) and the take_along_axis loss over
forward's float32 logits (old); plus the float32 [*, 102400] arrays and scatters in the optimized HLO."""
import re, sys, time, jax, jax.numpy as jnp
from te_async import models
from te_async.bench import presets, train_model

config = presets.config("deepseek-v2-lite", num_hidden_layers=4)
params = jax.eval_shape(lambda k: models.init_params(config, k, jnp.bfloat16), jax.random.key(0))
tokens = jax.ShapeDtypeStruct((1, 4097), jnp.int32)

def old(p, t):
    logits = models.forward(p, config, t[:, :-1], group_sizes_mode="device")
    picked = jnp.take_along_axis(logits, t[:, 1:, None], axis=-1)[..., 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)

steps = {"new": train_model.train_step(config, "device"), "old": jax.jit(jax.value_and_grad(old))}
for name in sys.argv[1:]:
    t0 = time.time()
    compiled, temp = train_model.compile_step(steps[name], [(params, tokens)])
    hlo = compiled.as_text()
    f32v = len(set(re.findall(r"%(\S+) = f32\[[0-9,]*102400\]", hlo)))
    scat = len(re.findall(r"= f32\[[0-9,]*102400\][^\n]*scatter\(", hlo))
    m = compiled.memory_analysis()
    print(f"{name}: temp {temp:.3f} GB, args {m.argument_size_in_bytes/1e9:.3f}, out {m.output_size_in_bytes/1e9:.3f}, "
          f"f32 [..,102400] values {f32v}, f32 vocab scatters {scat}, compile {time.time()-t0:.0f} s, jax {jax.__version__}")
