"""Node health: GPU faults, cordons, removals, and which nodes must be announced again."""
