from versus_cp.entry import main

raise SystemExit(main())
