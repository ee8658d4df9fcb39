"""lark-controller: the pool's job-aware OpenFlow controller (paper section VI).

larkd on every execution point registers each job (owner, group, addresses, MAC, attributes) over mutual TLS;
the controller compiles the admin's ClassAd policies into a few proactive flows per job, installs them on every
switch that connects (os-ken), waits for a barrier, and only then answers, so the job's first packet already
meets its flows.
"""
