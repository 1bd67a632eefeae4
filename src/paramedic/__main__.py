from paramedic.cli import run

run()
