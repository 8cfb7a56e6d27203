package bulk

const sysProcessVMReadv = 270
