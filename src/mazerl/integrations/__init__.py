"""Other RL frameworks playing mazerl's mazes: the dataset export (`export`, no extra needed) and the
skyrl-gym environment (`skyrl`, needs `mazerl[skyrl]`)."""
