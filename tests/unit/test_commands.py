"""What commands print (counts with their nouns, rows in columns), and a module's group mounted on ``litestar``."""

from __future__ import annotations

import click
from click.testing import CliRunner
from litestar import Litestar
from litestar.cli.main import litestar_group
from litestar.datastructures import State
from litestar.plugins import CLIPlugin

from app.core.commands import command_group, mount, plural, table


def test_a_count_of_one_takes_the_singular() -> None:
    assert plural(1, "overdue invoice") == "1 overdue invoice"
    assert plural(0, "webhook event") == "0 webhook events"
    assert plural(2, "event") == "2 events"


def test_a_table_pads_every_column_but_the_last() -> None:
    assert table([["NAME", "NEXT", "LAST"], ["Cron", "09:00", "never"]]) == "NAME  NEXT   LAST\nCron  09:00  never"


@command_group("greetings", help="A module's group, as a SaaS developer writes one.")
@click.option("--loud", is_flag=True, help="An option of the group itself.")
@click.pass_context
def greetings_group(context: click.Context, loud: bool) -> None:
    context.meta["loud"] = loud


@greetings_group.command(name="hello")
@click.pass_context
def hello_command(context: click.Context, app: Litestar) -> None:
    click.echo(f"hello from {app.state.greeter}{'!' if context.meta['loud'] else ''}")


@greetings_group.group(name="more")
def more_group() -> None:
    pass


@more_group.command(name="again")
def again_command(app: Litestar) -> None:
    click.echo(f"again from {app.state.greeter}")


class _GreetingsPlugin(CLIPlugin):
    def on_cli_init(self, cli: click.Group) -> None:
        mount(cli, greetings_group)


def create_greeting_app() -> Litestar:
    return Litestar(plugins=[_GreetingsPlugin()], state=State({"greeter": "the app"}))


def _fresh_litestar_cli() -> click.Group:
    """Litestar's root group as ``litestar`` runs it, new: it asks the CLI plugins for their commands once."""
    return type(litestar_group)(name="litestar", params=litestar_group.params, callback=litestar_group.callback)


def test_a_mounted_groups_commands_get_the_app_with_the_groups_options_and_subgroups() -> None:
    runner, app_path = CliRunner(), f"{__name__}:create_greeting_app"
    hello = runner.invoke(_fresh_litestar_cli(), ["--app", app_path, "greetings", "--loud", "hello"])
    assert (hello.exit_code, hello.output) == (0, "hello from the app!\n"), hello.output
    again = runner.invoke(_fresh_litestar_cli(), ["--app", app_path, "greetings", "more", "again"])
    assert (again.exit_code, again.output) == (0, "again from the app\n"), again.output
