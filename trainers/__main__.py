from trainers.cli import main

raise SystemExit(main())
