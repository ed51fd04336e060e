"""Research modules of the estimator: features, the learned ensemble, margins, the model zoos."""
