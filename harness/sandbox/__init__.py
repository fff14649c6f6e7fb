"""The sandbox: how untrusted code runs (`sandbox`: the environment, network, seccomp and starting processes in
it; `view`: the mount view; `limits`: the limits per role), the scratch folder of each sandboxed process
(`scratch`), the processes one owner started, stoppable at once (`running`), and the signed channel
the pool and a worker speak over (`channel`). It uses nothing of ours but `kb`."""
