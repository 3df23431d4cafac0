from collector.entry import main

raise SystemExit(main())
