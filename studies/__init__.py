"""Studies: simulations that measure the decision rules' error rates through their own code, and the noise
measurements that set those simulations' inputs. Not part of the harness; run as `python -m studies.NAME`."""
