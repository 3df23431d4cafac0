from versus_cp.main import main

raise SystemExit(main())
