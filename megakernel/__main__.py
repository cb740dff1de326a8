from megakernel.cli import main

raise SystemExit(main())
