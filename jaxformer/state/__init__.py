"""A run's state, below both training and inference so that neither imports the other: the
train-state layout (`train_state`), the optimizer that shapes it (`optim`) and checkpoint I/O
(`checkpoint`). Training builds and saves this state; inference restores it."""
