from gpuslice.cli.main import main

main()
