"""One module per public op: its argument-checking function and backend dispatch."""
