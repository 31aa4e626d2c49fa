"""python -m services.accounting: the ledger and the read models."""

from services.accounting.app import main

main()
