"""Learning: token log-probabilities, GRPO, behaviour cloning, checkpoints and the trainer loop."""
