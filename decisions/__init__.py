"""Decision rules: intervals, verdicts of runs apart, the paired sequential designs, the gate's screen and
confirmation, change points and time to solve. They read stored runs (`rundata`) and render nothing."""
