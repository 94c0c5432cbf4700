"""fedsketch's bridge to Flower: the records both the ServerApp and the ClientApp read and write
(``messages``), their bytes as Flower serializes them."""
