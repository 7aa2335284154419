# Sourced by the fine-tuning benchmarks: the learning rate chosen for Traditional before any strategy runs, from
# its runs at each rate in ROOT/lr<rate>/.
#   best_lr ROOT         the rate whose ROOT/lr<rate>/traditional.json (the benchmark harness's log) ended most accurate
#   lowest_loss_lr ROOT  the rate whose ROOT/lr<rate>/eval_results.json (a Trainer run's) ended at the lowest eval_loss
best_lr() {
    _chosen_lr "$1" traditional.json
}

lowest_loss_lr() {
    _chosen_lr "$1" eval_results.json
}

_chosen_lr() {  # ROOT FILE
    $PY - "$1" "$2" <<'PYTHON'
import glob, json, os, sys
root, name = sys.argv[1:]
logs = {os.path.basename(os.path.dirname(path))[2:]: json.load(open(path))
        for path in glob.glob(os.path.join(root, "lr*", name))}
if not logs:
    sys.exit(f"LR=auto: no {root}/lr*/{name} yet: run the benchmark's lr part first")
if name == "traditional.json":
    print(max(logs, key=lambda rate: logs[rate]["evals"][-1]["accuracy"]))
else:
    print(min(logs, key=lambda rate: logs[rate]["eval_loss"]))
PYTHON
}
