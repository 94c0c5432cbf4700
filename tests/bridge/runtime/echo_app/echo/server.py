"""Each round: one query to every node; prints the answers as one JSON line."""

import json

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    for _ in range(int(context.run_config["rounds"])):
        asks = [Message(RecordDict(), dst_node_id=node, message_type="query") for node in grid.get_node_ids()]
        answers = [
            dict(reply.content["who"]) for reply in grid.send_and_receive(asks, timeout=60) if reply.has_content()
        ]
        print(f"answers {json.dumps(answers)}", flush=True)
