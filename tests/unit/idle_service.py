"""A stand-in for a service process: does nothing until it is stopped (the supervisor's tests start it)."""

import time

if __name__ == "__main__":
    time.sleep(120)
