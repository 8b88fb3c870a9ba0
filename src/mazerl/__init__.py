"""mazerl: teach vision-language models to solve mazes turn by turn, and prove what they learned."""

__version__ = "0.1.0"
