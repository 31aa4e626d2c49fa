from services.kube_bridge.app import main

main()
