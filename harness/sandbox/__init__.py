"""The sandbox: how untrusted code runs (`sandbox`: the mount view, environment, network, seccomp and
limits per role, and starting processes in it), the scratch folder of each sandboxed process
(`scratch`), the processes one owner started, stoppable at once (`running`), and the signed channel
the pool and a worker speak over (`channel`). It uses nothing of ours but `kb`."""
