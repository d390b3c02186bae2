from pdctl.lab.engine.cli import main

raise SystemExit(main())
