from bridge_shell.cli import main

main()
