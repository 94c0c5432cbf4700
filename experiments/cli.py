"""The ``fedsketch`` command.

    fedsketch run [CONFIG] [--set key=value]... [--seeds N] [--strategies a,b] [--no-plan] [--restart]
    fedsketch plan [CONFIG] [--set key=value]... [--seeds N] [--strategies a,b] [--supernodes N]
    fedsketch plot RUN_DIR
    fedsketch report RUN_DIR [--target ACC ...]
    fedsketch deploy [CONFIG] [--supernodes N] [--tls] [--auth] [--isolation launcher|subprocess] [--set k=v]... [--restart]
    fedsketch deploy --kit DIR --server HOST [--supernodes N] [--port P]

``run`` with no CONFIG runs the embedded default (experiments/configs/default.toml):
FetchSGD against local top-k and uncompressed training on generated data,
through Flower's simulation runtime, then draws the plots and writes the
report. ``run`` and ``plan`` first check every run's data and model
(experiments/running/preflight.py); the Python API is experiments/api.py. An experiment
file's ``[sweep]`` table runs each strategy at every point of a grid of
compression settings (see experiments/running/sweep.py).

Ctrl-C (SIGINT) or SIGTERM stops ``run`` and ``deploy`` with every process they
started (exit 130 / 143; a second one forces), keeping what was measured;
SIGUSR1 skips only the current run; the next command stops what a SIGKILLed
one left (experiments/running/stopping.py, docs/stopping.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from experiments.running import command_plan
from experiments.running.command_plan import OUT, RUN_PLAN, SUPERNODES
from fedsketch.settings.setting import ConfigError

if TYPE_CHECKING:
    from experiments.deployment.deploy_commands import Deployment
    from fedsketch.config import RunConfig
    from fedsketch.server.runlog import RunSpec


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedsketch",
        description="Federated learning with Count Sketches (FetchSGD) and its baselines, on Flower.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Results go to runs/<experiment>/<strategy>/[<sweep point>/] (metrics.jsonl, config.json, flower.log).\n"
        "Ctrl-C / SIGTERM stop everything (exit 130 / 143); kill -USR1 PID skips the current run "
        "(docs/stopping.md).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run an experiment (default: the embedded default job)")
    _add_experiment_arguments(run, example_rounds=20)
    run.add_argument(
        "--supernodes",
        type=int,
        default=SUPERNODES,
        help=f"simulated Flower nodes; each runs a cohort of logical clients per round (default: {SUPERNODES})",
    )
    run.add_argument(
        "--gpus-per-node",
        type=float,
        default=None,
        metavar="F",
        help="GPUs per simulated node, e.g. 0.25: four nodes share one GPU (default: the visible GPUs "
        "split evenly over the nodes; 0 without a GPU)",
    )
    run.add_argument(
        "--backend",
        default=None,
        metavar="{inprocess,ray}",
        help="what runs the ClientApp calls: 'inprocess', Flower's simulation process itself (one "
        "process, no Ray), or 'ray', Ray actors (a Ray cluster when RAY_ADDRESS is set) "
        "(default: ray when RAY_ADDRESS is set, else inprocess)",
    )
    run.add_argument(
        "--runtime",
        choices=("process", "superlink"),
        default="process",
        help="how each run reaches Flower's simulation runtime: 'process', called in one process; or "
        "'superlink', through a private SuperLink and `flwr run` (four Flower processes, as `flwr run .` "
        "does) (default: process)",
    )
    run.add_argument("--no-plot", action="store_true", help="do not draw plots or write the report at the end")
    _add_restart(run)
    run.add_argument(
        "--no-plan",
        action="store_true",
        help="start without printing the byte plan (fedsketch plan: one in-process round per run)",
    )
    plan_parser = sub.add_parser("plan", help="what each run will send (round 1 run here, no Flower), before running")
    _add_experiment_arguments(plan_parser, example_rounds=20)
    plan_parser.add_argument(
        "--supernodes", type=int, default=SUPERNODES, help="simulated nodes (secure aggregation bills by them)"
    )
    plot = sub.add_parser("plot", help="draw accuracy vs rounds / upload bytes / total bytes, and the Pareto front")
    plot.add_argument("run_dir", type=Path, help="an experiment folder, e.g. runs/default")
    report = sub.add_parser("report", help="write report.md and report.csv: accuracy and bytes per run group")
    report.add_argument("run_dir", type=Path, help="an experiment folder, e.g. runs/default")
    report.add_argument(
        "--target",
        type=float,
        nargs="+",
        default=[],
        metavar="ACC",
        help="accuracies to report bytes-to-target for (default: 90%% of the best final)",
    )
    _add_deploy_parser(sub)
    run_plan_parser = sub.add_parser(RUN_PLAN)  # internal: the second half of `run` (running/command_plan.py)
    run_plan_parser.add_argument("plan", type=Path)
    return parser


def _add_restart(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--restart",
        action="store_true",
        help="delete the checkpoint of a run whose settings changed and start it over (without it such a run is "
        "refused; a checkpoint with the same settings, timeouts and eval-every aside, is always resumed)",
    )


def _add_experiment_arguments(parser: argparse.ArgumentParser, example_rounds: int) -> None:
    """What ``run`` and ``deploy`` both take: the experiment file, overrides, seeds, strategies, results folder."""
    parser.add_argument("config", nargs="?", type=Path, help="experiment TOML file (default: the embedded default)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a run setting, e.g. --set num-rounds={example_rounds} (repeatable)",
    )
    parser.add_argument("--seeds", type=int, help="number of seeds per strategy (overrides [compare] seeds)")
    parser.add_argument("--strategies", type=_names, help="comma-separated strategies (overrides [compare] strategies)")
    parser.add_argument("--out", type=Path, default=Path(OUT), help=f"results folder (default: {OUT})")


def _names(text: str) -> list[str] | None:
    """``--strategies a,b``: the names; an empty value names none."""
    return text.split(",") if text else None


def cmd_run(args: argparse.Namespace) -> int:
    """Validate every run first; then run the plan, here or, as the program, in a process without torch."""
    from bridge import flower
    from experiments.flower import spare

    try:
        if args.as_program and flower.internals():  # the first run's simulation process, importing meanwhile
            command_plan.start_spare(args.backend, args.runtime)
        validated = simulation_plan(args)
        if args.as_program:
            command_plan.exec_run_plan(validated)  # the same pid goes on as `run-plan`, without torch
        return command_plan.run_plan(command_plan.Plan.from_json(validated.to_json()))
    finally:
        spare.release()


def simulation_plan(args: argparse.Namespace) -> command_plan.Plan:
    """``run``'s runs and the federation they run on, each checked, and their byte plan printed; nothing is started."""
    from bridge import flower
    from experiments import api
    from experiments.running import forecast, runner

    overrides = runner.parse_overrides(args.overrides)
    experiment = api.prepare(args.config, overrides, args.out.resolve(), args.seeds, args.strategies)  # all checked
    _check_resumes(experiment.runs, args.restart)
    federation = api.federation(args.supernodes, args.gpus_per_node, args.backend, args.runtime)
    api.check_placement(experiment, federation)
    todo = [cfg for cfg in experiment.runs if not runner.is_finished(cfg)]
    if todo and not args.no_plan and flower.internals():  # one in-process round per run: each one's bytes
        print(forecast.render(*forecast.forecast(todo, federation.num_supernodes)), flush=True)
    elif todo and not args.no_plan:
        print(f"fedsketch: no byte plan: {PLAN_NEEDS} ({flower.public_only_reason()})", flush=True)
    return command_plan.Plan.of(experiment.runs, federation, plot=not args.no_plot)


def _check_resumes(runs: Sequence[RunSpec], restart: bool) -> None:
    """Refuse (or with ``--restart`` delete and say so) the checkpoints of runs whose settings changed."""
    from experiments.running import runner
    from fedsketch.server import runlog

    for cfg in runner.check_resumes(runs, restart):
        print(f"fedsketch: deleted {runlog.run_dir(cfg)} (--restart): its checkpoint was of other settings")


PLAN_NEEDS = "the byte plan runs a round in this process, which needs Flower internals (bridge/flower.py)"


def cmd_plan(args: argparse.Namespace) -> int:
    """Validate every run as ``run`` does; print what each will send (running/forecast.py); start no Flower."""
    from bridge import flower
    from experiments import api
    from experiments.running import forecast, runner

    if not flower.internals():
        print(f"fedsketch: error: {PLAN_NEEDS}, and runs on Flower's public API only: {flower.public_only_reason()}")
        return 2
    overrides = runner.parse_overrides(args.overrides)
    out = args.out.resolve()
    experiment = api.prepare(args.config, overrides, out, args.seeds, args.strategies, hand_over=False)  # all checked
    print(forecast.render(*forecast.forecast(experiment.runs, args.supernodes)))
    return 0


def cmd_run_plan(args: argparse.Namespace) -> int:
    """The second half of ``run``: the plan the first half validated and wrote."""
    from experiments.running.command_plan import run_plan_file

    return run_plan_file(args.plan)


def cmd_plot(args: argparse.Namespace) -> int:
    """Draw the plots of one experiment folder; name the runs that were stopped before their last round."""
    from experiments.analysis.plots import plot_experiment
    from experiments.analysis.results import collect_groups

    for plot in plot_experiment(args.run_dir):
        print(plot.path)
    for group in collect_groups(args.run_dir):
        for note in group.stopped:
            print(f"note: {group.label}: {note}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Write and print the report of one experiment folder."""
    from experiments.analysis.report import write_report

    try:
        _, markdown = write_report(args.run_dir, args.target)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    print(markdown, end="")
    return 0


def _add_deploy_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dep = sub.add_parser(
        "deploy",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="run on Flower's deployment runtime (SuperLink + SuperNodes), or write a kit for real devices",
        description="Without --kit: start a SuperLink and N SuperNodes on 127.0.0.1 (one client per SuperNode,\n"
        "its data the partition named by its --node-config), run the experiment, stop everything.\n"
        "With --kit DIR: start nothing; write certificates, SuperNode keys, scripts and a systemd unit\n"
        "for a real server and N devices into DIR, and a run config per run of the experiment (its\n"
        "settings with --set applied, experiment renamed NAME-kit), and print what to run where.",
    )
    _add_experiment_arguments(dep, example_rounds=5)
    dep.add_argument("--supernodes", type=int, default=3, help="SuperNodes, one client each (default: 3)")
    dep.add_argument("--tls", action="store_true", help="serve the SuperLink over TLS (a fresh CA and certificate)")
    dep.add_argument(
        "--auth", action="store_true", help="SuperNode authentication: register each node's key (needs --tls)"
    )
    dep.add_argument(
        "--isolation",
        choices=("launcher", "subprocess"),
        default="launcher",
        help="launcher: one warm process forks a ClientApp per message (default); "
        "subprocess: Flower's default, a fresh ClientApp process per message",
    )
    dep.add_argument("--no-plot", action="store_true", help="do not draw plots at the end")
    _add_restart(dep)
    dep.add_argument("--kit", type=Path, metavar="DIR", help="write a deployment kit for real devices into DIR")
    dep.add_argument("--server", metavar="HOST", help="with --kit: the server's address as devices reach it")
    dep.add_argument("--port", type=int, default=8000, help="with --kit: the SuperLink's port (default: 8000)")


def cmd_deploy(args: argparse.Namespace) -> int:
    """Run on a SuperLink and SuperNodes on this machine, or write a kit for real devices."""
    from experiments.deployment import deploy

    if args.kit is not None:
        return _write_kit(args)
    deployment, runs = local_deployment(args)
    return deploy.run_all(deployment, runs, plot=not args.no_plot)


def _write_kit(args: argparse.Namespace) -> int:
    """``deploy --kit DIR``: the experiment's runs checked as the devices will run them, and the kit written."""
    from experiments.analysis import tracking
    from experiments.deployment.recipe import kit_runs, write_kit
    from experiments.running import runner
    from experiments.running.preflight import check_runs

    if not args.server:
        raise ConfigError("--kit needs --server HOST: the address devices use to reach the SuperLink")
    config, overrides = args.config or runner.DEFAULT_CONFIG, runner.parse_overrides(args.overrides)
    try:
        runs = kit_runs(args.supernodes, config, overrides, args.strategies, args.seeds, str(args.out))
        check_runs(runs, here=False)  # they run on the devices, not here
        tracking.refuse_in_kit(runs)
        print(write_kit(args.kit, args.server, args.supernodes, args.port, runs))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return 0


def local_deployment(args: argparse.Namespace) -> tuple[Deployment, tuple[RunConfig, ...]]:
    """``deploy`` without ``--kit``: what to start and its runs, each checked, as one client per SuperNode, a
    quorum a round and checkpoints unless ``--set`` says otherwise (which it prints); nothing is started."""
    from bridge import flower
    from experiments import api
    from experiments.deployment import deploy_commands as dc
    from experiments.running import runner

    isolation = args.isolation if flower.internals() else "subprocess"  # the launcher reaches Flower's internals
    if isolation != args.isolation:
        print(f"fedsketch: SuperNodes run Flower's own isolation, not the launcher ({flower.public_only_reason()})")
    try:
        deployment = dc.Deployment(args.supernodes, tls=args.tls, auth=args.auth, isolation=isolation)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    settings, given = dc.node_settings(args.supernodes), runner.parse_overrides(args.overrides)
    runs = api.prepare(args.config, {**settings, **given}, args.out.resolve(), args.seeds, args.strategies).runs
    runs = runs if "checkpoint-every" in given else dc.checkpointed(runs)
    _check_resumes(runs, args.restart)
    shown = " ".join(f"{k}={given.get(k, v)}" for k, v in settings.items())
    saves = sorted({cfg.strategy for cfg in runs if cfg.checkpoint_every and "checkpoint-every" not in given})
    if saves:
        shown += f" checkpoint-every={dc.CHECKPOINT_EVERY} ({', '.join(saves)})"
    print(f"deployment settings: {shown} (change with --set)")
    return deployment, runs


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fedsketch`` console script.

    Run as the program (``argv`` is ``None``), a command stopped by a signal exits as soon as
    everything it started is stopped and its outcome printed, without tearing down torch's modules.
    """
    code = _dispatch(argv)
    if argv is None and code > 128:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _dispatch(argv: list[str] | None) -> int:
    from experiments.running.stopping import Interrupted

    parser = _parser()
    args = parser.parse_args(argv)
    args.as_program = argv is None
    for name in ("supernodes", "seeds"):  # run, plan, deploy; [compare] seeds are checked with the file
        if getattr(args, name, None) is not None and getattr(args, name) < 1:
            parser.error(f"argument --{name}: must be at least 1; got {getattr(args, name)}")
    commands = {
        "run": cmd_run,
        "plan": cmd_plan,
        RUN_PLAN: cmd_run_plan,
        "plot": cmd_plot,
        "report": cmd_report,
        "deploy": cmd_deploy,
    }
    try:
        return commands[args.command](args)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"fedsketch: error: {exc}", file=sys.stderr)
        return 2
    except Interrupted as stop:  # between runs, or while the processes were being stopped: all stopped by now
        return stop.exit_code
    except KeyboardInterrupt:  # before anything was started
        return 130


if __name__ == "__main__":
    sys.exit(main())
