"""What the server keeps and writes besides a method's state: the books (``books``), sparse downloads
(``download``), the learning-rate schedule (``schedule``), evaluation (``evaluate``), checkpoints
(``checkpoint``), the run's logs (``runlog``) and client-level DP (``privacy``)."""
