"""The unit GPU shares are counted in: thousandths of a GPU (a fraction of 250 is a quarter of a GPU), in integers
so that every machine computes the same sums."""

FULL = 1000  # thousandths of a GPU: one whole GPU
