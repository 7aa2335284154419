# Sourced by the fine-tuning benchmarks: best_lr ROOT prints the learning rate whose Traditional run in
# ROOT/lr<rate>/traditional.json ended most accurate (the rate chosen for Traditional before any strategy runs).
best_lr() {
    $PY - "$1" <<'PYTHON'
import glob, json, os, sys
runs = {os.path.basename(os.path.dirname(path))[2:]: json.load(open(path))["evals"][-1]["accuracy"]
        for path in glob.glob(os.path.join(sys.argv[1], "lr*", "traditional.json"))}
if not runs:
    sys.exit(f"LR=auto: no {sys.argv[1]}/lr*/traditional.json yet: run the benchmark's lr part first")
print(max(runs, key=runs.get))
PYTHON
}
