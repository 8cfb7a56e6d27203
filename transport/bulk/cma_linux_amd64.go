package bulk

const sysProcessVMReadv = 310
