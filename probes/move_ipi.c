// UFFDIO_MOVE cost per page, run length 1..64, with and without another thread of the
// process running on CPU 1 (the TLB flush of each move then needs an IPI).
// Build: gcc -O2 -pthread move_ipi.c -o move_ipi; run: ./move_ipi 0 && ./move_ipi 1 (root).
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
struct uffdio_move { __u64 dst; __u64 src; __u64 len; __u64 mode; __s64 move; };
#define UFFDIO_MOVE _IOWR(UFFDIO, 0x05, struct uffdio_move)
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
static volatile int stop;
static void *spin(void*a){ cpu_set_t s;CPU_ZERO(&s);CPU_SET(1,&s);sched_setaffinity(0,sizeof s,&s); while(!stop); return 0;}
static int uffd;
static double mv(char*dst,char*src,size_t n,size_t batch){ double t=now(); for(size_t i=0;i<n;i+=batch){ struct uffdio_move m={.dst=(unsigned long)dst+i*4096,.src=(unsigned long)src+i*4096,.len=batch*4096}; if(ioctl(uffd,UFFDIO_MOVE,&m)) {perror("move");exit(1);} } return (now()-t)/n/1e3; }
int main(int argc,char**argv){
  int spinner=atoi(argv[1]); size_t pg=4096,n=16384;
  cpu_set_t s;CPU_ZERO(&s);CPU_SET(0,&s);sched_setaffinity(0,sizeof s,&s);
  uffd=syscall(SYS_userfaultfd,O_CLOEXEC);
  struct uffdio_api api={.api=UFFD_API,.features=(1<<16)}; if(ioctl(uffd,UFFDIO_API,&api)){perror("api");return 1;}
  char *r=mmap(0,n*pg,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  char *st=mmap(0,n*pg,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  madvise(r,n*pg,MADV_NOHUGEPAGE); madvise(st,n*pg,MADV_NOHUGEPAGE);
  for(size_t i=0;i<n;i++) r[i*pg]=1;
  struct uffdio_register reg={.range={(unsigned long)r,n*pg},.mode=UFFDIO_REGISTER_MODE_MISSING}; ioctl(uffd,UFFDIO_REGISTER,&reg);
  struct uffdio_register reg2={.range={(unsigned long)st,n*pg},.mode=UFFDIO_REGISTER_MODE_MISSING}; ioctl(uffd,UFFDIO_REGISTER,&reg2);
  pthread_t t; if(spinner) pthread_create(&t,0,spin,0);
  usleep(10000);
  for(size_t b=1;b<=64;b*=4){
    double a=mv(st,r,n,b), c=mv(r,st,n,b);
    /* madvise dontneed cost on a 32-page range of an empty area */
    printf("spinner=%d batch=%3zu: move out %.2f us/page, back %.2f us/page\n",spinner,b,a,c);
  }
  /* DONTNEED batch cost */
  double t0=now(); for(size_t i=0;i<n;i+=32) madvise(st+i*pg,32*pg,MADV_DONTNEED); printf("dontneed(32, empty) %.2f us/call\n",(now()-t0)/(n/32)/1e3);

  stop=1; return 0;
}
