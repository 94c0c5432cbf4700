"""lab.toml from Python: the model builder and the data as objects, through the same Flower runtime."""

from mylab.data import load
from mylab.model import build

from experiments.api import run

rows = run("lab.toml", model=build, data=load(), out="runs-api")
last = {row["strategy"]: row for row in rows}  # rows come in round order, run by run
for strategy, row in last.items():
    print(
        f"{strategy:>10}: accuracy {row['test_accuracy']:.4f} after {row['round']} rounds, "
        f"uploaded {row['cum_upload_bytes']:,} B, downloaded {row['cum_download_bytes']:,} B"
    )
