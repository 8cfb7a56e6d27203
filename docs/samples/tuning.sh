# a training job's memory profile, logging at INFO for the init and network subsystems
NEXAR_MEMORY_PROFILE=training NEXAR_DEBUG=INFO NEXAR_DEBUG_SUBSYS=INIT,NET \
    nexar run -n 2 -- python allreduce.py
