# The near-convergence workload of benchmarks/run_paper_regime.sh, sourced by it and by run_budget.sh
# (WORKLOAD=scratch) so that both train the same thing: CIFAR-10, 2,500 training / 2,000 test images, the
# paper's step schedule (lr divided by 5 at 30/60/80 % of the run). The caller adds the dataset, epochs,
# cutout and threads.
PAPER_REGIME_FLAGS=(--max_train_samples 2500 --max_eval_samples 2000 --model "${MODEL:-cifar_convnet_half}"
    --lr_scheduler_type constant --lr_decay_milestones 0.3 0.6 0.8 --lr_decay_factor 0.2)
