from collector.main import main

raise SystemExit(main())
