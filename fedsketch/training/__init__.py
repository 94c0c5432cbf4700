"""A client's local training: one client's gradient or local steps (``local``), and many clients' in one
vectorized call on a GPU (``batched``)."""
