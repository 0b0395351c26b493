"""The GPU run kit's snapshot check: the snapshot memprofd took during training,
read by transformers as any Hugging Face checkpoint.

  check_snapshot_hf.py DAEMON_RESULTS.json DEVICE OUT.json

- AutoModelForCausalLM.from_pretrained(dir) loads it with no missing, unexpected
  or mismatched tensor (fp32, eager attention: the daemon's math);
- every tensor in its safetensors files equals the loaded model's, bit for bit;
- its loss on the daemon's batch (the one window of the token file, batch_size
  times) is finite and equals the loss memprofd reported for the step after the
  snapshot (same weights, same batch), within a relative 1e-4 (the two sides
  reduce in different orders);
- the daemon's evaluation of the snapshot on that window equals transformers'
  in float32 (relative 1e-4) and under bf16 autocast (relative 2e-2: bf16
  matmuls, different kernels on each side).
Writes {"checks": [...], "loss": ..., "daemon_loss": ...} to OUT.json.
"""
import glob
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from transformers import AutoModelForCausalLM

results_path, device, out_path = sys.argv[1:4]
res = json.load(open(results_path))
snap = res["snapshot"]
checks = []


def check(name, ok, detail=""):
    checks.append({"name": name, "ok": bool(ok), "detail": str(detail)})
    print("%-5s %s %s" % ("ok" if ok else "FAIL", name, detail), flush=True)


t0 = time.time()
model, info = AutoModelForCausalLM.from_pretrained(
    snap["directory"], dtype=torch.float32, attn_implementation="eager",
    device_map=device, output_loading_info=True)
model.eval()
load_seconds = time.time() - t0
problems = {k: v for k, v in info.items() if v}
check("transformers loads the snapshot", not problems,
      "%s, %d parameters, %.1f s" % (type(model).__name__, model.num_parameters(), load_seconds)
      if not problems else problems)
check("same parameter count as the daemon", model.num_parameters() == res["num_parameters"],
      "%d vs %d" % (model.num_parameters(), res["num_parameters"]))

# Names, shapes and values: each file's tensors against the loaded state_dict.
state = model.state_dict()
seen, bad = 0, []
for path in sorted(glob.glob(os.path.join(snap["directory"], "*.safetensors"))):
    with safe_open(path, framework="pt", device="cpu") as f:
        for name in f.keys():
            seen += 1
            t = f.get_tensor(name)
            mine = state.get(name)
            if mine is None or mine.shape != t.shape or not torch.equal(mine.cpu(), t.to(mine.dtype)):
                bad.append(name)
check("every saved tensor equals the loaded one", seen > 0 and not bad,
      "%d tensors%s" % (seen, (", differ: %s" % bad[:5]) if bad else ""))

# The loss on the daemon's batch with the snapshot's weights.
ids = np.fromfile(res["tokens"], dtype="<u4").astype(np.int64)
window = torch.from_numpy(ids).to(device).unsqueeze(0).expand(res["batch_size"], -1)
inputs, targets = window[:, :-1], window[:, 1:]
with torch.no_grad():
    logits = model(input_ids=inputs).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).item()
daemon_loss = snap["next_step_loss"]
rel = abs(loss - daemon_loss) / max(abs(daemon_loss), 1e-12) if daemon_loss is not None else None
check("its loss is finite", math.isfinite(loss), "%.6f" % loss)
check("its loss equals the daemon's at global step %d" % (snap["global_step"] + 1),
      rel is not None and rel <= 1e-4,
      "transformers %.6f, memprofd %s (relative difference %s)" % (
          loss, daemon_loss, "%.1e" % rel if rel is not None else "n/a"))

# The daemon's evaluations of the snapshot (drive_daemon.py): float32 as
# above; bf16 autocast over float32 weights, as torch.autocast runs this model.
bf16_loss = None
for precision, tolerance in (("no", 1e-4), ("bf16", 2e-2)):
    theirs = snap.get("eval_loss_" + precision)
    if precision == "bf16":
        with torch.no_grad(), torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
            logits = model(input_ids=inputs[:1]).logits
        bf16_loss = mine = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                           targets[:1].reshape(-1)).item()
    else:
        mine = loss
    gap = abs(mine - theirs) / max(abs(theirs), 1e-12) if theirs is not None else None
    check("its %s evaluation equals transformers'" % ("bf16" if precision == "bf16" else "float32"),
          gap is not None and gap <= tolerance,
          "transformers %.6f, memprofd %s (relative difference %s, tolerance %g)" % (
              mine, theirs, "%.1e" % gap if gap is not None else "n/a", tolerance))
json.dump({"checks": checks, "loss": loss, "daemon_loss": daemon_loss, "relative_difference": rel,
           "bf16_loss": bf16_loss, "daemon_bf16_loss": snap.get("eval_loss_bf16"),
           "load_seconds": load_seconds}, open(out_path, "w"), indent=1)
sys.exit(0 if all(c["ok"] for c in checks) else 1)
