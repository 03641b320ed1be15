from hpo.cli import main

main()
