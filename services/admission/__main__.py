"""python -m services.admission"""

from services.admission.app import main

main()
