"""What a node runs for its logical clients: their cohort (``cohort``), the state a client keeps
(``state``), and each upload judged as the server judges it, or merged with its cohort's (``uploads``)."""
